"""memlib.extract"""
