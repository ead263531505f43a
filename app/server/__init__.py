"""The local OpenAI-compatible HTTP server (`phoenix-chat serve`).

It is hosted beside the engine's `Scheduler` in whatever process loaded the model (the CLI's
`serve`, later the GUI's engine worker): `start_server(scheduler, ServerConfig(...))` runs
uvicorn on a background thread and returns a `RunningServer` to stop it. One module, one job:
config (what to bind, the key, limits), security (ASGI guards), parsing (OpenAI bodies into
engine `Request`s), responses (OpenAI shapes), api_errors (error objects), routes (endpoints),
asgi (the app), running (the thread).
"""
