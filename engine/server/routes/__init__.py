"""The engine server's HTTP routes, one module per group; ``engine.server.app.create_app`` adds them in order.

``schema`` (``/openapi.json``; no ``/docs``, see there), ``about`` (``/info``, ``/models``, ``/metrics``), ``plan``
(``/plan``) and ``jobs`` (``/jobs`` and a job's events, volumes and cancel). Each ``add_*`` function adds
its routes to the app with what they need; the token gate covers them all (an outermost middleware).
"""
