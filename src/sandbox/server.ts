import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { z } from 'zod';
import { BatchSubmission, SessionRequest, Submission, type SubmissionResult } from '../records/sandbox.js';
import { decodeFiles, type Runner, SessionNotFound, TooManySessions } from './pool.js';

const MAX_BODY = 256 * 1024 * 1024;

export interface ServerOptions {
  host: string;
  port: number;
  token?: string;
  runner: Runner;
  /** Extra text for /health. */
  describe?: () => Record<string, unknown>;
  /** Submissions of one stream request that may run at once (back-pressure beyond it). */
  streamWindow?: number;
}

class HttpError extends Error {
  constructor(
    readonly status: number,
    message: string,
  ) {
    super(message);
  }
}

/** code-judge's /judge answers carry no output. */
function judgeView(r: SubmissionResult) {
  return { sub_id: r.sub_id, success: r.success, run_success: r.run_success, cost: r.cost, reason: r.reason };
}

async function readBody(req: IncomingMessage): Promise<Buffer> {
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of req as AsyncIterable<Buffer>) {
    size += chunk.length;
    if (size > MAX_BODY) throw new HttpError(413, `request body over ${MAX_BODY} bytes`);
    chunks.push(chunk);
  }
  return Buffer.concat(chunks);
}

function parse<S extends z.ZodType>(schema: S, body: Buffer): z.output<S> {
  let value: unknown;
  try {
    value = JSON.parse(body.toString('utf8'));
  } catch (error) {
    throw new HttpError(422, `invalid JSON: ${(error as Error).message}`);
  }
  const parsed = schema.safeParse(value);
  if (!parsed.success) {
    const issue = parsed.error.issues[0];
    throw new HttpError(422, `${issue.path.map(String).join('.') || '(body)'}: ${issue.message}`);
  }
  return parsed.data;
}

function send(res: ServerResponse, status: number, body: unknown): void {
  const text = JSON.stringify(body);
  res.writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text) });
  res.end(text);
}

const newId = () => crypto.randomUUID();

/**
 * `files` names: relative paths inside the working directory (no `..`, no absolute path, no empty
 * segment); contents base64. A bad one is a 422 naming it.
 */
export function checkFiles(files: Record<string, string> | null | undefined, where: string): void {
  if (!files) return;
  for (const [name, content] of Object.entries(files)) {
    const parts = name.split('/');
    if (
      name === '' ||
      name.startsWith('/') ||
      name.includes('\0') ||
      parts.some((p) => p === '' || p === '.' || p === '..' || Buffer.byteLength(p) > 255)
    )
      throw new HttpError(
        422,
        `${where}.${name}: a file name must be a relative path inside the working directory`,
      );
    if (!/^[A-Za-z0-9+/]*={0,2}$/.test(content.replace(/\s+/g, '')))
      throw new HttpError(422, `${where}.${name}: content must be base64`);
  }
}

const SESSION_ROUTE = /^\/sessions\/([^/]+)(\/fork)?$/;

/**
 * The HTTP face of the sandbox: code-judge's routes and shapes, plus `POST /run/stream`
 * (NDJSON submissions in, NDJSON results out in input order, as they complete), `/health`
 * and `/metrics`.
 */
export function createSandboxServer(options: ServerOptions): Server {
  const { runner, token } = options;
  const window = options.streamWindow ?? 2048;
  // Ids the server makes up only label the answer: deduplication is for ids the caller chose.
  const submit = async (s: Submission, long: boolean): Promise<SubmissionResult> => {
    checkFiles(s.files, 'files');
    const result = await runner.submit(s, long);
    return s.sub_id === undefined || s.sub_id === null ? { ...result, sub_id: newId() } : result;
  };

  async function batch(req: IncomingMessage, long: boolean) {
    const body = parse(BatchSubmission, await readBody(req));
    if (body.submissions.length === 0) throw new HttpError(422, 'submissions: must not be empty');
    const results = await Promise.all(body.submissions.map((s) => submit(s, long)));
    const batchId = (body as { sub_id?: unknown }).sub_id ?? newId();
    return { sub_id: batchId, results };
  }

  async function stream(req: IncomingMessage, res: ServerResponse): Promise<void> {
    res.writeHead(200, { 'content-type': 'application/x-ndjson' });
    const pending: Promise<SubmissionResult>[] = [];
    let next = 0;
    let writing = Promise.resolve();
    // Results that complete in the same tick go out in one write (one syscall, one chunk).
    let corked = false;
    const uncork = () => {
      corked = false;
      res.uncork();
    };
    const flush = async () => {
      while (next < pending.length) {
        const result = await pending[next];
        pending[next] = undefined as unknown as Promise<SubmissionResult>;
        next += 1;
        if (!corked) {
          corked = true;
          res.cork();
          process.nextTick(uncork);
        }
        if (!res.write(`${JSON.stringify(result)}\n`)) await new Promise((r) => res.once('drain', r));
      }
    };
    let partial = '';
    let line = 0;
    const take = (text: string) => {
      line += 1;
      if (text.trim() === '') return;
      let submission: Submission;
      try {
        submission = parse(Submission, Buffer.from(text));
      } catch (error) {
        pending.push(
          Promise.resolve({
            sub_id: null,
            success: false,
            run_success: false,
            cost: 0,
            reason: 'invalid_input',
            stdout: null,
            stderr: `line ${line}: ${(error as Error).message}`,
          }),
        );
        return;
      }
      pending.push(submit(submission, true));
    };
    for await (const chunk of req as AsyncIterable<Buffer>) {
      const lines = (partial + chunk.toString('utf8')).split('\n');
      partial = lines.pop() ?? '';
      for (const text of lines) take(text);
      writing = writing.then(flush);
      // Back-pressure: stop reading while too many of this request's calls are unanswered.
      while (pending.length - next > window) await Promise.race([pending[next], writing]);
    }
    if (partial !== '') take(partial);
    writing = writing.then(flush);
    await writing;
    res.end();
  }

  /** Session errors as HTTP: unknown 404, no room 503, sessions unavailable here 501. */
  async function sessionCall<T>(call: () => Promise<T>): Promise<T> {
    try {
      return await call();
    } catch (error) {
      if (error instanceof SessionNotFound) throw new HttpError(404, error.message);
      if (error instanceof TooManySessions) throw new HttpError(503, error.message);
      if (/sessions need the isolated sandbox/.test((error as Error).message))
        throw new HttpError(501, (error as Error).message);
      throw error;
    }
  }

  async function handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const url = (req.url ?? '/').split('?')[0];
    if (req.method === 'GET' && (url === '/health' || url === '/ping')) {
      return send(res, 200, { status: 'ok', ...(options.describe?.() ?? {}) });
    }
    if (token !== undefined && req.headers.authorization !== `Bearer ${token}`) {
      throw new HttpError(401, 'missing or wrong bearer token');
    }
    if (req.method === 'GET' && url === '/metrics') {
      const text = runner.metrics.text();
      res.writeHead(200, { 'content-type': 'text/plain; version=0.0.4' });
      res.end(text);
      return;
    }
    const session = SESSION_ROUTE.exec(url);
    if (session && req.method === 'DELETE' && !session[2]) {
      const id = decodeURIComponent(session[1]);
      if (!(await runner.closeSession(id))) throw new HttpError(404, new SessionNotFound(id).message);
      return send(res, 200, { session_id: id, closed: true });
    }
    if (session && req.method === 'POST' && session[2]) {
      const id = decodeURIComponent(session[1]);
      return send(res, 200, await sessionCall(() => runner.forkSession(id)));
    }
    if (req.method !== 'POST') throw new HttpError(404, `no route ${req.method} ${url}`);
    switch (url) {
      case '/run':
      case '/judge': {
        const result = await submit(parse(Submission, await readBody(req)), false);
        // One call for a session that is not there: a 404, as the session routes answer.
        if (result.reason === 'session_not_found')
          throw new HttpError(404, result.stderr ?? 'session not found');
        return send(res, 200, url === '/judge' ? judgeView(result) : result);
      }
      case '/sessions': {
        const body = await readBody(req);
        const request = body.length === 0 ? {} : parse(SessionRequest, body);
        checkFiles(request.files, 'files');
        return send(res, 200, await sessionCall(() => runner.createSession(decodeFiles(request.files))));
      }
      case '/run/batch':
      case '/run/long-batch':
        return send(res, 200, await batch(req, url.endsWith('long-batch')));
      case '/judge/batch':
      case '/judge/long-batch': {
        const out = await batch(req, url.endsWith('long-batch'));
        return send(res, 200, { sub_id: out.sub_id, results: out.results.map(judgeView) });
      }
      case '/run/stream':
        return stream(req, res);
      default:
        throw new HttpError(404, `no route POST ${url}`);
    }
  }

  const server = createServer((req, res) => {
    handle(req, res).catch((error: unknown) => {
      const status = error instanceof HttpError ? error.status : 500;
      if (res.headersSent) {
        res.destroy();
        return;
      }
      send(res, status, { detail: (error as Error).message });
    });
  });
  server.keepAliveTimeout = 65_000;
  server.headersTimeout = 70_000;
  server.requestTimeout = 0;
  return server;
}

export { listen } from '../process/listening.js';
