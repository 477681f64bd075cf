"""The API reference page: a small page of Sluice's own that draws ``/openapi.json`` (no CDN, so it
works on a machine without internet; its script and style come from this process). For every
operation: its parameters, its request body's schema and example, and each answer's schema and
example; an error answer shows the problem+json shape and the ``x-problem-codes`` it may carry."""

from __future__ import annotations

PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Sluice API reference</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="stylesheet" href="/reference.css"></head>
<body><header><h1>Sluice API</h1><p id="info">Reading /openapi.json...</p>
<p>Every route but <code>/v1/health</code> and <code>/openapi.json</code> needs
<code>Authorization: Bearer &lt;key&gt;</code> (<code>sluice keys create</code>). Errors are
<code>application/problem+json</code> with a stable <code>code</code>; each error answer below
lists the codes it may carry (docs/api.md, Errors, says what each means and what to do).
The document itself: <a href="/openapi.json">/openapi.json</a>.</p>
<nav id="toc"></nav><section id="problem"></section></header>
<main id="ops"></main><script src="/reference.js"></script></body></html>
"""

STYLE = """body{font:15px/1.5 system-ui,sans-serif;margin:0 auto;max-width:64rem;padding:1rem;
color:#222}
code,pre{font-family:ui-monospace,monospace;font-size:13px}pre{background:#f5f5f5;padding:.5rem;
overflow:auto;margin:.25rem 0}section{border-top:1px solid #ddd;padding:.5rem 0}
.m{display:inline-block;width:4.5rem;font-weight:700}.get{color:#07c}.post{color:#080}
.delete{color:#c00}.patch{color:#a60}table{border-collapse:collapse;margin:.25rem 0}
td,th{border:1px solid #ddd;padding:2px 6px;text-align:left;vertical-align:top}
details{margin:.1rem 0}summary{cursor:pointer}.schema,.schema ul{margin:0;padding-left:1rem;
list-style:none}.schema li>.row{margin-left:1.1rem}.t{color:#666}.req{color:#c00}.d{color:#555}
.codes code{margin-right:.4rem}h4{margin:.5rem 0 .2rem}.status{font-weight:700}
#toc{display:flex;flex-wrap:wrap;gap:.1rem .8rem}#toc a{white-space:nowrap}
"""

SCRIPT = r"""(function () {
  "use strict";
  var spec;
  function el(tag, text, cls) {
    var e = document.createElement(tag);
    if (text !== undefined) e.textContent = text;
    if (cls) e.className = cls;
    return e;
  }
  function refName(s) { return s && s.$ref ? s.$ref.split("/").pop() : ""; }
  function resolve(s) {
    var seen = 0;
    while (s && s.$ref && seen++ < 20) s = spec.components.schemas[refName(s)];
    return s || {};
  }
  function nullable(s) {
    var alts = s.anyOf || s.oneOf;
    if (!alts || alts.length !== 2) return null;
    var other = alts.filter(function (a) { return a.type !== "null"; });
    return other.length === 1 ? other[0] : null;
  }
  function typeOf(s) {
    var name = refName(s), r = resolve(s);
    if (name) return name + (r.type && r.type !== "object" ? " (" + r.type + ")" : "");
    var one = nullable(s);
    if (one) return typeOf(one) + " or null";
    if (s.anyOf || s.oneOf) return (s.anyOf || s.oneOf).map(typeOf).join(" | ");
    if (s.type === "array") return "array of " + typeOf(s.items || {});
    if (s.enum) return s.enum.map(JSON.stringify).join(" | ");
    if (s.const !== undefined) return JSON.stringify(s.const);
    return (s.type || "any") + (s.format ? " (" + s.format + ")" : "");
  }
  var RULES = ["minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "minLength",
    "maxLength", "minItems", "maxItems", "minProperties", "pattern", "default"];
  function rules(s) {
    return RULES.filter(function (k) { return s[k] !== undefined; }).map(function (k) {
      return k + " " + JSON.stringify(s[k]);
    }).join(", ");
  }
  function children(s) {
    // what a reader opens: an object's properties, an array's items, the alternatives of a union
    var r = resolve(s), one = nullable(r);
    if (one) return children(one);
    if (r.type === "array" && r.items) return children(r.items);
    if (r.anyOf || r.oneOf) {
      return (r.anyOf || r.oneOf).map(function (a, i) { return ["(" + (i + 1) + ")", a, false]; });
    }
    var out = Object.keys(r.properties || {}).map(function (k) {
      return [k, r.properties[k], (r.required || []).indexOf(k) >= 0];
    });
    if (r.additionalProperties && typeof r.additionalProperties === "object") {
      out.push(["(any other key)", r.additionalProperties, false]);
    }
    return out;
  }
  function tree(s, label, required, depth, seen) {
    // one schema as a <details> row: its name, type, rules and description; open for its fields
    var r = resolve(s), name = refName(s) || refName(nullable(s) || {});
    var head = el("span", undefined, "row");
    head.appendChild(el("code", label));
    if (required) head.appendChild(el("span", " required", "req"));
    head.appendChild(el("span", " " + typeOf(s), "t"));
    var extra = rules(r);
    if (extra) head.appendChild(el("span", " [" + extra + "]", "t"));
    var text = s.description || r.description;
    if (text) head.appendChild(el("span", " : " + text, "d"));
    var kids = name && seen.indexOf(name) >= 0 ? [] : children(s);
    if (!kids.length || depth > 8) {
      var leaf = el("li");
      leaf.appendChild(head);
      return leaf;
    }
    var d = el("details"), ul = el("ul"), next = name ? seen.concat([name]) : seen;
    if (depth < 1) d.open = true;
    var summary = el("summary");
    summary.appendChild(head);
    d.appendChild(summary);
    kids.forEach(function (k) { ul.appendChild(tree(k[1], k[0], k[2], depth + 1, next)); });
    d.appendChild(ul);
    var li = el("li");
    li.appendChild(d);
    return li;
  }
  function schemaBlock(s, label) {
    var ul = el("ul", undefined, "schema");
    ul.appendChild(tree(s || {}, label, false, 0, []));
    return ul;
  }
  function exampleOf(media) {
    if (media.example !== undefined) return media.example;
    if (media.examples) {
      var first = media.examples[Object.keys(media.examples)[0]];
      if (first && first.value !== undefined) return first.value;
    }
    var r = resolve(media.schema || {});
    return r.examples && r.examples.length ? r.examples[0] : undefined;
  }
  function exampleBlock(value, what) {
    var wrap = el("div");
    wrap.appendChild(el("h4", what));
    var text = typeof value === "string" ? value : JSON.stringify(value, null, 2);
    wrap.appendChild(el("pre", text, "example"));
    return wrap;
  }
  function media(content, label, what) {
    var out = el("div");
    Object.keys(content || {}).forEach(function (type) {
      var m = content[type];
      out.appendChild(el("p", label + " " + type));
      if (m.schema) out.appendChild(schemaBlock(m.schema, "schema"));
      var ex = exampleOf(m);
      if (ex !== undefined) out.appendChild(exampleBlock(ex, what));
    });
    return out;
  }
  function params(op) {
    var t = el("table"), h = el("tr");
    ["name", "in", "type", "required", "description"].forEach(function (c) {
      h.appendChild(el("th", c));
    });
    t.appendChild(h);
    (op.parameters || []).forEach(function (p) {
      var r = el("tr"), s = p.schema, cell = el("td");
      if (!s && p.content) s = p.content[Object.keys(p.content)[0]].schema;
      s = s || {};
      [p.name, p.in].forEach(function (c) { r.appendChild(el("td", String(c))); });
      if (children(s).length) cell.appendChild(schemaBlock(s, p.content ? "JSON" : typeOf(s)));
      else cell.textContent = typeOf(s) + (rules(s) ? " [" + rules(s) + "]" : "");
      r.appendChild(cell);
      r.appendChild(el("td", p.required ? "yes" : ""));
      r.appendChild(el("td", p.description || s.description || ""));
      t.appendChild(r);
    });
    return t;
  }
  function answer(status, resp) {
    var div = el("div", undefined, "response");
    div.setAttribute("data-status", status);
    var h = el("h4");
    h.appendChild(el("span", status, "status"));
    h.appendChild(document.createTextNode(" " + (resp.description || "")));
    div.appendChild(h);
    var error = status === "default" || Number(status) >= 400;
    if (error) {
      var codes = resp["x-problem-codes"] || [];
      var p = el("p", "problem+json (the shape above)" + (codes.length ? "; code: " : ""), "codes");
      codes.forEach(function (c) { p.appendChild(el("code", c)); });
      div.appendChild(p);
    } else {
      div.appendChild(media(resp.content, "Answer:", "Example answer"));
    }
    return div;
  }
  function operation(path, method, op) {
    var s = el("section", undefined, "op"), h = el("h3");
    s.id = op.operationId || method + path;
    s.setAttribute("data-op", method.toUpperCase() + " " + path);
    h.appendChild(el("span", method.toUpperCase(), "m " + method));
    h.appendChild(el("code", path));
    s.appendChild(h);
    if (op.summary) s.appendChild(el("p", op.summary));
    if (op.description) s.appendChild(el("p", op.description));
    if ((op.parameters || []).length) s.appendChild(params(op));
    if (op.requestBody) {
      s.appendChild(media(op.requestBody.content, "Request body:", "Example request"));
    }
    Object.keys(op.responses || {}).forEach(function (status) {
      s.appendChild(answer(status, op.responses[status]));
    });
    return s;
  }
  function problemShape() {
    var box = document.getElementById("problem"), ref = {$ref: "#/components/schemas/ProblemOut"};
    box.appendChild(el("h2", "Errors: application/problem+json"));
    box.appendChild(schemaBlock(ref, "problem"));
    var ex = resolve(ref).examples;
    if (ex && ex.length) box.appendChild(exampleBlock(ex[0], "Example problem"));
  }
  fetch("/openapi.json").then(function (r) { return r.json(); }).then(function (doc) {
    spec = doc;
    document.getElementById("info").textContent = spec.info.title + " " + spec.info.version;
    var main = document.getElementById("ops"), toc = document.getElementById("toc");
    problemShape();
    Object.keys(spec.paths).forEach(function (path) {
      Object.keys(spec.paths[path]).forEach(function (method) {
        var section = operation(path, method, spec.paths[path][method]), a = el("a");
        main.appendChild(section);
        a.href = "#" + section.id;
        a.textContent = method.toUpperCase() + " " + path;
        toc.appendChild(a);
      });
    });
    document.body.setAttribute("data-drawn", "yes");
  }).catch(function (e) {
    document.getElementById("info").textContent = "could not read /openapi.json: " + e;
  });
})();
"""
