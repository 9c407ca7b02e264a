import type { z } from 'zod';
import { Doctor } from './doctor.js';
import { EvalProblem, EvalSummary, Report } from './eval.js';
import { Problem } from './problem.js';
import { BatchSubmission, Submission, SubmissionResult } from './sandbox.js';
import { EndBatch, Step } from './step.js';
import { TrainRecord, Trajectory } from './trajectory.js';
import { ScoredTrajectory, VerifyCase } from './verify.js';

export * from './doctor.js';
export * from './eval.js';
export * from './problem.js';
export * from './sandbox.js';
export * from './step.js';
export * from './trajectory.js';
export * from './verify.js';

/** The records `rstar schema NAME` can print. */
export const RECORDS: Record<string, z.ZodType> = {
  problem: Problem,
  trajectory: Trajectory,
  'train-record': TrainRecord,
  step: Step,
  'end-batch': EndBatch,
  'eval-problem': EvalProblem,
  'eval-summary': EvalSummary,
  'eval-report': Report,
  submission: Submission,
  'batch-submission': BatchSubmission,
  'submission-result': SubmissionResult,
  'verify-case': VerifyCase,
  'scored-trajectory': ScoredTrajectory,
  doctor: Doctor,
};
