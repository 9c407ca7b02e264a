/**
 * Python's `json.loads` (CPython 3.11, C scanner), reduced to what the Hermes tool parser needs:
 * the value on success, and on failure the exact error text Python prints, because the release
 * feeds that text back to the model as `Failed to decode tool call: <error>`.
 */

export type PyJson = null | boolean | number | string | PyJson[] | { [key: string]: PyJson };

export type PyLoadsResult = { ok: true; value: PyJson } | { ok: false; error: string };

class DecodeError extends Error {
  constructor(
    readonly msg: string,
    readonly pos: number,
  ) {
    super(msg);
  }
}

class StopScan extends Error {
  constructor(readonly pos: number) {
    super('stop');
  }
}

const WS = new Set([' ', '\t', '\n', '\r']);
const ESCAPES: Record<string, string> = {
  '"': '"',
  '\\': '\\',
  '/': '/',
  b: '\b',
  f: '\f',
  n: '\n',
  r: '\r',
  t: '\t',
};
const NUMBER = /^(-?(?:0|[1-9][0-9]*))(\.[0-9]+)?([eE][-+]?[0-9]+)?/;

/** Parses over code points so error positions are Python string indices. */
class Scanner {
  readonly s: string[];
  constructor(text: string) {
    this.s = Array.from(text);
  }

  ws(i: number): number {
    while (i < this.s.length && WS.has(this.s[i])) i++;
    return i;
  }

  startsWith(i: number, word: string): boolean {
    return this.s.slice(i, i + word.length).join('') === word;
  }

  /** One value at `i`; StopScan when nothing there starts a value ("Expecting value"). */
  value(i: number): [PyJson, number] {
    const c = this.s[i];
    if (c === undefined) throw new StopScan(i);
    if (c === '"') return this.string(i + 1);
    if (c === '{') return this.object(i + 1);
    if (c === '[') return this.array(i + 1);
    if (c === 'n' && this.startsWith(i, 'null')) return [null, i + 4];
    if (c === 't' && this.startsWith(i, 'true')) return [true, i + 4];
    if (c === 'f' && this.startsWith(i, 'false')) return [false, i + 5];
    if (c === 'N' && this.startsWith(i, 'NaN')) return [Number.NaN, i + 3];
    if (c === 'I' && this.startsWith(i, 'Infinity')) return [Number.POSITIVE_INFINITY, i + 8];
    if (c === '-' && this.startsWith(i, '-Infinity')) return [Number.NEGATIVE_INFINITY, i + 9];
    const m = NUMBER.exec(this.s.slice(i, i + 400).join(''));
    if (m !== null && (c === '-' || (c >= '0' && c <= '9'))) return [Number(m[0]), i + m[0].length];
    throw new StopScan(i);
  }

  string(end: number): [string, number] {
    const begin = end - 1;
    let out = '';
    for (;;) {
      const c = this.s[end];
      if (c === undefined) throw new DecodeError('Unterminated string starting at', begin);
      if (c === '"') return [out, end + 1];
      if (c !== '\\') {
        if (c.codePointAt(0)! <= 0x1f) throw new DecodeError('Invalid control character at', end);
        out += c;
        end++;
        continue;
      }
      const esc = this.s[end + 1];
      if (esc === undefined) throw new DecodeError('Unterminated string starting at', begin);
      if (esc !== 'u') {
        const ch = ESCAPES[esc];
        if (ch === undefined) throw new DecodeError('Invalid \\escape', end);
        out += ch;
        end += 2;
        continue;
      }
      let code = this.hex4(end + 2, end + 1);
      end += 6;
      if (code >= 0xd800 && code <= 0xdbff && this.s[end] === '\\' && this.s[end + 1] === 'u') {
        const low = this.hex4(end + 2, end + 1);
        if (low >= 0xdc00 && low <= 0xdfff) {
          code = 0x10000 + ((code - 0xd800) << 10) + (low - 0xdc00);
          end += 6;
        }
      }
      out += String.fromCodePoint(code);
    }
  }

  hex4(i: number, escapeAt: number): number {
    const h = this.s.slice(i, i + 4).join('');
    if (!/^[0-9a-fA-F]{4}$/.test(h)) throw new DecodeError('Invalid \\uXXXX escape', escapeAt);
    return Number.parseInt(h, 16);
  }

  object(i: number): [Record<string, PyJson>, number] {
    const out: Record<string, PyJson> = {};
    i = this.ws(i);
    if (this.s[i] === '}') return [out, i + 1];
    for (;;) {
      if (this.s[i] !== '"') throw new DecodeError('Expecting property name enclosed in double quotes', i);
      const [key, afterKey] = this.string(i + 1);
      i = this.ws(afterKey);
      if (this.s[i] !== ':') throw new DecodeError("Expecting ':' delimiter", i);
      i = this.ws(i + 1);
      const [v, afterValue] = this.expectValue(i);
      out[key] = v;
      i = this.ws(afterValue);
      if (this.s[i] === '}') return [out, i + 1];
      if (this.s[i] !== ',') throw new DecodeError("Expecting ',' delimiter", i);
      i = this.ws(i + 1);
    }
  }

  array(i: number): [PyJson[], number] {
    const out: PyJson[] = [];
    i = this.ws(i);
    if (this.s[i] === ']') return [out, i + 1];
    for (;;) {
      const [v, after] = this.expectValue(i);
      out.push(v);
      i = this.ws(after);
      if (this.s[i] === ']') return [out, i + 1];
      if (this.s[i] !== ',') throw new DecodeError("Expecting ',' delimiter", i);
      i = this.ws(i + 1);
    }
  }

  expectValue(i: number): [PyJson, number] {
    try {
      return this.value(i);
    } catch (error) {
      if (error instanceof StopScan) throw new DecodeError('Expecting value', error.pos);
      throw error;
    }
  }

  /** `msg: line L column C (char P)`, as json.JSONDecodeError formats it. */
  format(e: DecodeError): string {
    const before = this.s.slice(0, e.pos);
    const line = before.filter((c) => c === '\n').length + 1;
    const col = e.pos - before.lastIndexOf('\n');
    return `${e.msg}: line ${line} column ${col} (char ${e.pos})`;
  }
}

export function pyJsonLoads(text: string): PyLoadsResult {
  const sc = new Scanner(text);
  try {
    const [value, end] = sc.expectValue(sc.ws(0));
    const rest = sc.ws(end);
    if (rest !== sc.s.length) throw new DecodeError('Extra data', rest);
    return { ok: true, value };
  } catch (error) {
    if (error instanceof DecodeError) return { ok: false, error: sc.format(error) };
    throw error;
  }
}

/** Python's `type(x).__name__` for a decoded JSON value. */
export function pyTypeName(value: PyJson): string {
  if (value === null) return 'NoneType';
  if (typeof value === 'boolean') return 'bool';
  if (typeof value === 'number') return Number.isInteger(value) && Number.isFinite(value) ? 'int' : 'float';
  if (typeof value === 'string') return 'str';
  return Array.isArray(value) ? 'list' : 'dict';
}

/** Python's `repr(str)`: single quotes unless the text holds a single quote and no double quote. */
export function pyRepr(text: string): string {
  const quote = text.includes("'") && !text.includes('"') ? '"' : "'";
  let out = quote;
  for (const ch of text) {
    const c = ch.codePointAt(0)!;
    if (ch === '\\') out += '\\\\';
    else if (ch === quote) out += `\\${quote}`;
    else if (ch === '\n') out += '\\n';
    else if (ch === '\r') out += '\\r';
    else if (ch === '\t') out += '\\t';
    else if (c < 0x20 || c === 0x7f) out += `\\x${c.toString(16).padStart(2, '0')}`;
    else out += ch;
  }
  return out + quote;
}

/** Python's `json.dumps(value, ensure_ascii=False)`: `, ` and `: ` separators. */
export function pyJsonDumps(value: PyJson): string {
  if (value === null) return 'null';
  if (typeof value === 'boolean') return value ? 'true' : 'false';
  if (typeof value === 'number') {
    if (Number.isNaN(value)) return 'NaN';
    if (!Number.isFinite(value)) return value > 0 ? 'Infinity' : '-Infinity';
    return JSON.stringify(value);
  }
  if (typeof value === 'string') return JSON.stringify(value);
  if (Array.isArray(value)) return `[${value.map(pyJsonDumps).join(', ')}]`;
  return `{${Object.entries(value)
    .map(([k, v]) => `${JSON.stringify(k)}: ${pyJsonDumps(v)}`)
    .join(', ')}}`;
}
