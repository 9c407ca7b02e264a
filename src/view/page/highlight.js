// A small Python highlighter for tool-call code: the code is cut into tokens and each becomes a
// text node in a <span> of its class, so the code is shown, never interpreted.

const KEYWORDS = new Set(
  'False None True and as assert async await break class continue def del elif else except finally for from global if import in is lambda nonlocal not or pass raise return try while with yield print range len sum int str float list dict set tuple'.split(
    ' ',
  ),
);

const TOKEN =
  /("""[\s\S]*?(?:"""|$)|'''[\s\S]*?(?:'''|$)|"(?:[^"\\\n]|\\.)*"?|'(?:[^'\\\n]|\\.)*'?)|(#[^\n]*)|(\b\d[\d_]*(?:\.\d*)?(?:[eE][+-]?\d+)?j?\b)|([A-Za-z_]\w*)|(\s+|[^\sA-Za-z_\d"'#]+|.)/g;

/** Python source as [class, text] pairs; the texts concatenate back to the source exactly. */
export function pythonTokens(code) {
  const out = [];
  for (const m of String(code).matchAll(TOKEN)) {
    if (m[1] !== undefined) out.push(['str', m[0]]);
    else if (m[2] !== undefined) out.push(['com', m[0]]);
    else if (m[3] !== undefined) out.push(['num', m[0]]);
    else if (m[4] !== undefined) out.push([KEYWORDS.has(m[0]) ? 'kw' : '', m[0]]);
    else out.push(['', m[0]]);
  }
  return out;
}

/** A <pre> of highlighted Python. */
export function highlight(code) {
  const pre = document.createElement('pre');
  pre.className = 'code';
  for (const [cls, text] of pythonTokens(code)) {
    if (cls === '') pre.append(document.createTextNode(text));
    else {
      const span = document.createElement('span');
      span.className = cls;
      span.textContent = text;
      pre.append(span);
    }
  }
  return pre;
}
