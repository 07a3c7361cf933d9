"""Anthropic's Messages API (`POST /v1/messages`) on the chat completions path: a Messages request
becomes a chat request (messages_request.py), runs through `generation` like any chat call, and
comes back as a Message (messages_body.py) or its typed event stream (messages_stream.py); errors
take Anthropic's shape (anthropic_errors.py). A nested package of `openai`, which reaches in."""
