"""memlib.retrieve"""
