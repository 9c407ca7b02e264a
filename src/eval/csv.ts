import { DataError } from '../errors.js';

/** One CSV record with the line it starts on (quoted fields may span lines). */
export interface CsvRow {
  fields: string[];
  line: number;
}

/**
 * RFC 4180 CSV: comma-separated, fields optionally double-quoted, `""` escapes a quote inside
 * quotes, quoted fields may hold commas and newlines; CRLF or LF line ends. GPQA's questions are
 * multi-line, so a line-based split would not do.
 */
export function parseCsv(text: string, source: string): CsvRow[] {
  const rows: CsvRow[] = [];
  let fields: string[] = [];
  let field = '';
  let quoted = false;
  let line = 1;
  let rowLine = 1;
  let fieldStarted = false;
  const endRow = () => {
    fields.push(field);
    if (!(fields.length === 1 && fields[0] === '' && !fieldStarted)) rows.push({ fields, line: rowLine });
    fields = [];
    field = '';
    fieldStarted = false;
  };
  let i = text.charCodeAt(0) === 0xfeff ? 1 : 0;
  while (i < text.length) {
    const ch = text[i];
    if (quoted) {
      if (ch === '"') {
        if (text[i + 1] === '"') {
          field += '"';
          i += 2;
          continue;
        }
        quoted = false;
        i += 1;
        const next = text[i];
        if (next !== undefined && next !== ',' && next !== '\n' && next !== '\r') {
          throw new DataError(`${source}:${line}: invalid CSV: text after a closing quote`);
        }
        continue;
      }
      if (ch === '\n') line += 1;
      field += ch;
      i += 1;
      continue;
    }
    if (ch === '"' && field === '') {
      quoted = true;
      fieldStarted = true;
      i += 1;
    } else if (ch === ',') {
      fields.push(field);
      field = '';
      fieldStarted = true;
      i += 1;
    } else if (ch === '\r' || ch === '\n') {
      endRow();
      i += ch === '\r' && text[i + 1] === '\n' ? 2 : 1;
      line += 1;
      rowLine = line;
    } else {
      field += ch;
      fieldStarted = true;
      i += 1;
    }
  }
  if (quoted) throw new DataError(`${source}:${rowLine}: invalid CSV: unterminated quoted field`);
  if (field !== '' || fields.length > 0 || fieldStarted) endRow();
  return rows;
}
