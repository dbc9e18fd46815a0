"""memlib.graph"""
