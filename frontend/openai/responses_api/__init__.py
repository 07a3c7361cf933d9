"""OpenAI's Responses API (`POST /v1/responses`, GET / DELETE `/v1/responses/{id}`) on the chat
completions path: a Responses request becomes a chat request (responses_request.py), runs through
`generation` like any chat call, and comes back as a Response object (response_object.py) or its
typed event stream (response_events.py); answers are kept per API key for previous_response_id
(response_store.py). A nested package of `openai`, which reaches in."""
