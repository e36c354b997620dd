"""``agentrl view``: a local web UI over run folders (the trajectory store and ``metrics.jsonl``).

:mod:`.store` reads the run folders (read-only, a fresh snapshot per request, so a running
run can be watched); :mod:`.server` serves the JSON API and the page (``static/``: plain
HTML, JavaScript and CSS, no build step and nothing fetched from the network).
"""
