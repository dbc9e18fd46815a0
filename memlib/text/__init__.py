"""memlib.text"""
