// Every node of the page is built here, from text: model output, tool output and problem text are
// untrusted, so nothing is ever parsed as HTML (no innerHTML, no attribute from data but text
// content, class names and internal #/ links built by the page itself).

/** An element: `h('td', {class: 'num'}, 'text', child)`. Strings become text nodes. */
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) continue;
    if (k === 'onclick' || k === 'oninput' || k === 'onchange') el.addEventListener(k.slice(2), v);
    else if (k === 'href') el.setAttribute('href', safeHref(v));
    else el.setAttribute(k, String(v));
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const c of children.flat(Infinity)) {
    if (c === undefined || c === null || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
}

/** Only the page's own routes are links: a `javascript:` or outside URL never becomes an href. */
export function safeHref(v) {
  const s = String(v);
  return s.startsWith('#/') ? s : '#/';
}

/** Replaces an element's children. */
export function fill(el, ...children) {
  el.replaceChildren();
  append(el, children);
  return el;
}

export function fmt(x, digits = 3) {
  if (x === undefined || x === null || Number.isNaN(x)) return '';
  if (typeof x !== 'number') return String(x);
  if (Number.isInteger(x)) return String(x);
  return x.toFixed(digits);
}

/** A table from column headers and rows of cells (strings, numbers or nodes). */
export function table(headers, rows, attrs = {}) {
  return h(
    'table',
    attrs,
    h(
      'thead',
      {},
      h(
        'tr',
        {},
        headers.map((x) => h('th', {}, x)),
      ),
    ),
    h(
      'tbody',
      {},
      rows.map((r) =>
        r instanceof Node
          ? r
          : h(
              'tr',
              {},
              r.map((c) =>
                h('td', typeof c === 'number' ? { class: 'num' } : {}, typeof c === 'number' ? fmt(c) : c),
              ),
            ),
      ),
    ),
  );
}

/**
 * Markdown from the toolchain's reports (`eval --compare`): tables become tables, other lines
 * paragraphs, every cell text. Markup inside (HTML, links) stays literal text.
 */
export function markdown(text) {
  const out = [];
  let rows = [];
  const flush = () => {
    if (rows.length === 0) return;
    const cells = rows
      .filter((r) => !/^\|\s*-/.test(r))
      .map((r) =>
        r
          .replace(/^\||\|$/g, '')
          .split('|')
          .map((c) => c.trim()),
      );
    out.push(table(cells[0], cells.slice(1), { class: 'md' }));
    rows = [];
  };
  for (const line of String(text).split('\n')) {
    if (line.trim().startsWith('|')) rows.push(line.trim());
    else {
      flush();
      if (line.trim() !== '') out.push(h('p', {}, line));
    }
  }
  flush();
  return out;
}
