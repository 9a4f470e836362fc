"""The serving console: every endpoint and its replicas, latency and autoscaler decisions, live, in a browser.

``routes``     the pages, their JSON and server-sent events under ``/console/`` (sign-in, CSP, scoped tokens)
``pages``      the HTML shells (their scripts and styles in ``static/``, uPlot vendored in ``static/vendor/``)
``views``      what a row or a page shows, from an endpoint's view, timeline and canary state (pure)
``timeline``   the last hour, one point a second per served entity (pure)
``recorder``   feeds the timeline from the autoscaler's step
"""
