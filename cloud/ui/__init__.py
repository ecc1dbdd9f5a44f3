"""The dashboard at `/ui`: one static page that reads the REST API in the browser.

The page holds no data, so serving it needs no token; the browser sends the tenant's
bearer token with each API call it makes (`static/app.js`). Nothing here is built:
`static/` holds the HTML, the JavaScript module and the stylesheet as they are served.
"""
