"""The running assistant: the engine (one base model, the active adapter, streamed replies),
the chat service (a message in, a stored turn out) and compare (blind picks between
checkpoints)."""
