"""memlib.eval"""
