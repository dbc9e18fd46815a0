"""The retrieval service without Ray: auth, request/response models, validation, metrics,
the framework-free :class:`~memlib.serve.service.SearchService` and the FastAPI app
(:func:`~memlib.serve.app.build_app`). ``jobs/serve.py`` wraps the app in Ray Serve."""
