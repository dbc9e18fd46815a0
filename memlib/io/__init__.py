"""memlib.io"""
