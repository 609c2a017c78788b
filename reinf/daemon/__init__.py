"""``reinf serve``'s background half and the processes around it: the training schedule
(``scheduler``), the child trainer (``worker``), the daemon that runs both and hot-swaps
(``background``), lock files (``lock``), graceful stop (``shutdown``), the OS service
(``service``), talking to a running server (``remote``) and ``reinf status`` (``status``)."""
