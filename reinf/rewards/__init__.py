"""Ratings into rewards: the person's reward mapper (``mapper``), run in a child process
(``hooks``), and the built-in critics it may call (``critics``)."""
