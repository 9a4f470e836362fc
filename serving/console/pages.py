"""The console's HTML: three small shells (sign-in, endpoints, one endpoint) whose scripts fill them from the
console's JSON and server-sent events. No inline script or style (the Content-Security-Policy forbids them)."""

from __future__ import annotations

from html import escape

UPLOT = "vendor/uPlot.iife.min.js"  # uPlot 1.6.32 (static/vendor/README.md)

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)


def _page(title: str, body: str, scripts: tuple[str, ...] = (), styles: tuple[str, ...] = ()) -> str:
    links = "".join(f'<link rel="stylesheet" href="/console/static/{s}">' for s in ("console.css", *styles))
    tags = "".join(f'<script src="/console/static/{s}" defer></script>' for s in scripts)
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        f"<title>{escape(title)} - tollfree console</title>{links}{tags}</head>"
        f'<body><header><a href="/console/">tollfree console</a>{body}</body></html>'
    )


def sign_in(message: str | None = None) -> str:
    shown = f'<p class="error">{escape(message)}</p>' if message else ""
    return _page(
        "Sign in",
        "</header><main><h1>Sign in</h1>"
        f"{shown}"
        '<form method="post" action="/console/sign-in">'
        '<label>Token <input type="password" name="token" autocomplete="current-password" required></label>'
        '<button type="submit">Sign in</button></form>'
        "<p>The gateway's admin token, or a scoped token of the tokens file (it sees only its endpoints).</p></main>",
    )


def _sign_out(who: str) -> str:
    return (
        f'<span class="who">{escape(who)}</span>'
        '<form method="post" action="/console/sign-out"><button type="submit">Sign out</button></form></header>'
    )


def endpoints(who: str) -> str:
    return _page(
        "Endpoints",
        _sign_out(who) + '<main><h1>Endpoints</h1><p id="status">connecting...</p>'
        '<table id="endpoints"><thead><tr><th>endpoint</th><th>state</th><th>served entities (version, share)</th>'
        "<th>ready replicas</th><th>requests/s</th><th>5xx</th><th>p99 / goal</th><th>needs a look</th></tr></thead>"
        "<tbody></tbody></table></main>",
        scripts=("endpoints.js",),
    )


def endpoint(who: str, name: str, admin: bool) -> str:
    actions = (
        '<section><h2>Traffic split</h2><form id="split"></form><p id="split-status"></p></section>' if admin else ""
    )
    return _page(
        name,
        _sign_out(who) + f'<main id="endpoint" data-endpoint="{escape(name)}"><h1>{escape(name)}</h1>'
        '<p id="status">connecting...</p><p id="flags"></p>'
        '<section id="charts"></section>'
        '<section><h2>Served entities</h2><table id="entities"></table></section>'
        f"{actions}"
        '<section><h2>Canary</h2><div id="canary">none</div></section>'
        '<section><h2>Skew and drift</h2><div id="monitoring">no run has compared data yet</div></section>'
        '<section><h2>Autoscaler decisions</h2><table id="decisions"></table></section>'
        '<section><h2>Replicas</h2><div id="replicas"></div></section></main>',
        scripts=(UPLOT, "endpoint.js"),
        styles=("vendor/uPlot.min.css",),
    )
