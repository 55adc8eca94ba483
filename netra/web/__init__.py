"""HTTP pieces both servers share — the embedded engine's worker server and the response layer — so that
neither imports the other: OpenAI's error object, reading a request body within a limit, a listening
socket with TCP_NODELAY (and a test server thread), and Prometheus exposition with per-process labels."""
