"""The retrieval service without Ray: auth, request/response models, validation, metrics,
the framework-free :class:`~memlib.serve.service.SearchService`, the MCP tools over it
(:mod:`~memlib.serve.mcp_tools`, served over HTTP by :mod:`~memlib.serve.mcp_http` and over
stdio by :mod:`~memlib.serve.mcp_stdio`), the explorer's read views (:mod:`~memlib.serve.explore`,
page in ``ui/``) and the FastAPI app (:func:`~memlib.serve.app.build_app`). ``jobs/serve.py``
wraps the app in Ray Serve."""
