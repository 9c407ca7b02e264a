import type { IncomingMessage } from 'node:http';

/** A request's JSON body (`{}` when empty), as the fake engines read it. */
export const readJsonBody = (req: IncomingMessage): Promise<Record<string, unknown>> =>
  new Promise((resolve, reject) => {
    let s = '';
    req.setEncoding('utf8');
    req.on('data', (d) => {
      s += d;
    });
    req.on('end', () => {
      try {
        resolve(JSON.parse(s || '{}') as Record<string, unknown>);
      } catch (e) {
        reject(e);
      }
    });
  });
