"""memlib.llm"""
