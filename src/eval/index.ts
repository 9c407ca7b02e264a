export { type GpqaOptions, gpqaProblems, LETTERS } from './gpqa.js';
export {
  type EvalProblemRecord,
  type EvalSummaryRecord,
  isCorrect,
  isFormatViolation,
  problemRecord,
  type Sample,
  summarize,
  toSample,
} from './metrics.js';
export { lengthSpec, passAtKSpec, renderSvg } from './plots.js';
export { type Benchmark, benchmarkName, loadBenchmark, type ProblemsFormat } from './problems.js';
export { compareReports, markdownReport, markdownTable, type Report, readReport } from './report.js';
export { type BenchmarkResult, evaluateBenchmark, type Sourced, writeReport } from './run.js';
export { loadVerifier, type Verifier } from './verifier.js';
