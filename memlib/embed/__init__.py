"""memlib.embed"""
