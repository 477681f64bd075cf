"""The API reference page: a small page of Sluice's own that draws ``/openapi.json`` (no CDN, so it
works on a machine without internet; its script and style come from this process)."""

from __future__ import annotations

PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Sluice API reference</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="stylesheet" href="/reference.css"></head>
<body><header><h1>Sluice API</h1><p id="info">Reading /openapi.json...</p>
<p>Every route but <code>/v1/health</code> and <code>/openapi.json</code> needs
<code>Authorization: Bearer &lt;key&gt;</code> (<code>sluice keys create</code>). Errors are
<code>application/problem+json</code> with a stable <code>code</code>.
The document itself: <a href="/openapi.json">/openapi.json</a>.</p></header>
<main id="ops"></main><script src="/reference.js"></script></body></html>
"""

STYLE = """body{font:15px/1.5 system-ui,sans-serif;margin:0 auto;max-width:60rem;padding:1rem;
color:#222}
code,pre{font-family:ui-monospace,monospace;font-size:13px}pre{background:#f5f5f5;padding:.5rem;
overflow:auto}section{border-top:1px solid #ddd;padding:.5rem 0}
.m{display:inline-block;width:4.5rem;font-weight:700}.get{color:#07c}.post{color:#080}.delete{color:#c00}table{border-collapse:collapse}
td,th{border:1px solid #ddd;padding:2px 6px;text-align:left;vertical-align:top}
"""

SCRIPT = r"""(function () {
  "use strict";
  function el(tag, text, cls) {
    var e = document.createElement(tag);
    if (text !== undefined) e.textContent = text;
    if (cls) e.className = cls;
    return e;
  }
  function ref(spec, s) {
    if (s && s.$ref) return ref(spec, spec.components.schemas[s.$ref.split("/").pop()]);
    return s || {};
  }
  function params(op) {
    var t = el("table"), h = el("tr");
    ["name", "in", "type", "required", "description"].forEach(function (c) {
      h.appendChild(el("th", c));
    });
    t.appendChild(h);
    (op.parameters || []).forEach(function (p) {
      var r = el("tr"), s = p.schema || {};
      [p.name, p.in, s.type || (s.anyOf ? "optional" : ""), p.required ? "yes" : "",
       p.description || ""].forEach(function (c) { r.appendChild(el("td", String(c))); });
      t.appendChild(r);
    });
    return t;
  }
  function operation(spec, path, method, op) {
    var s = el("section"), h = el("h3");
    h.appendChild(el("span", method.toUpperCase(), "m " + method));
    h.appendChild(el("code", path));
    s.appendChild(h);
    if (op.summary) s.appendChild(el("p", op.summary));
    if (op.description) s.appendChild(el("p", op.description));
    if ((op.parameters || []).length) s.appendChild(params(op));
    var body = op.requestBody && op.requestBody.content;
    if (body) {
      Object.keys(body).forEach(function (type) {
        s.appendChild(el("p", "Request body: " + type));
        s.appendChild(el("pre", JSON.stringify(ref(spec, body[type].schema), null, 2)));
      });
    }
    var codes = el("p", "Answers: " + Object.keys(op.responses || {}).join(", "));
    s.appendChild(codes);
    return s;
  }
  fetch("/openapi.json").then(function (r) { return r.json(); }).then(function (spec) {
    document.getElementById("info").textContent = spec.info.title + " " + spec.info.version;
    var main = document.getElementById("ops");
    Object.keys(spec.paths).forEach(function (path) {
      Object.keys(spec.paths[path]).forEach(function (method) {
        main.appendChild(operation(spec, path, method, spec.paths[path][method]));
      });
    });
  }).catch(function (e) {
    document.getElementById("info").textContent = "could not read /openapi.json: " + e;
  });
})();
"""
