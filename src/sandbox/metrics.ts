/** Prometheus text exposition of the service's counters, gauges and latency histogram. */
const BUCKETS = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60];

export class Metrics {
  readonly byReason = new Map<string, number>();
  readonly buckets = new Array<number>(BUCKETS.length).fill(0);
  latencySum = 0;
  latencyCount = 0;
  workerRestarts = 0;
  deduplicated = 0;
  sessionsExpired = 0;
  sessionsEvicted = 0;
  gauges: () => {
    queueDepth: number;
    inflight: number;
    workers: number;
    workersAlive: number;
    sessions: number;
  } = () => ({
    queueDepth: 0,
    inflight: 0,
    workers: 0,
    workersAlive: 0,
    sessions: 0,
  });

  record(reason: string, seconds: number): void {
    this.byReason.set(reason, (this.byReason.get(reason) ?? 0) + 1);
    this.latencySum += seconds;
    this.latencyCount += 1;
    for (let i = 0; i < BUCKETS.length; i += 1) if (seconds <= BUCKETS[i]) this.buckets[i] += 1;
  }

  text(): string {
    const g = this.gauges();
    const out = [
      '# HELP rstar_sandbox_queue_depth Submissions waiting for an executor.',
      '# TYPE rstar_sandbox_queue_depth gauge',
      `rstar_sandbox_queue_depth ${g.queueDepth}`,
      '# HELP rstar_sandbox_inflight Submissions running now.',
      '# TYPE rstar_sandbox_inflight gauge',
      `rstar_sandbox_inflight ${g.inflight}`,
      '# HELP rstar_sandbox_workers Executors configured and alive.',
      '# TYPE rstar_sandbox_workers gauge',
      `rstar_sandbox_workers{state="configured"} ${g.workers}`,
      `rstar_sandbox_workers{state="alive"} ${g.workersAlive}`,
      '# HELP rstar_sandbox_worker_restarts_total Executors that died and were restarted.',
      '# TYPE rstar_sandbox_worker_restarts_total counter',
      `rstar_sandbox_worker_restarts_total ${this.workerRestarts}`,
      '# HELP rstar_sandbox_deduplicated_total Submissions answered from an earlier run with the same sub_id.',
      '# TYPE rstar_sandbox_deduplicated_total counter',
      `rstar_sandbox_deduplicated_total ${this.deduplicated}`,
      '# HELP rstar_sandbox_sessions Stateful sessions held now.',
      '# TYPE rstar_sandbox_sessions gauge',
      `rstar_sandbox_sessions ${g.sessions}`,
      '# HELP rstar_sandbox_sessions_closed_total Sessions the server closed itself: idle past the TTL, or to stay under --max-sessions / --session-memory.',
      '# TYPE rstar_sandbox_sessions_closed_total counter',
      `rstar_sandbox_sessions_closed_total{why="ttl"} ${this.sessionsExpired}`,
      `rstar_sandbox_sessions_closed_total{why="evicted"} ${this.sessionsEvicted}`,
      '# HELP rstar_sandbox_calls_total Answered submissions by reason ("" = ran normally).',
      '# TYPE rstar_sandbox_calls_total counter',
    ];
    for (const [reason, count] of this.byReason)
      out.push(`rstar_sandbox_calls_total{reason="${reason}"} ${count}`);
    out.push(
      '# HELP rstar_sandbox_latency_seconds Time from receipt to answer per submission.',
      '# TYPE rstar_sandbox_latency_seconds histogram',
    );
    BUCKETS.forEach((le, i) => {
      out.push(`rstar_sandbox_latency_seconds_bucket{le="${le}"} ${this.buckets[i]}`);
    });
    out.push(`rstar_sandbox_latency_seconds_bucket{le="+Inf"} ${this.latencyCount}`);
    out.push(`rstar_sandbox_latency_seconds_sum ${this.latencySum}`);
    out.push(`rstar_sandbox_latency_seconds_count ${this.latencyCount}`);
    return `${out.join('\n')}\n`;
  }
}
