/** The rollout package's public surface; the runner itself is `runner.ts`. */
export type { AgentIO, AgentOptions, AgentResult, Generation, Script } from './agent.js';
export { AgentAbort, runAgent, ServiceFailure, scriptedTrajectory } from './agent.js';
export { ROLLOUT_DEFAULTS } from './defaults.js';
export type { Capacity, EngineClient, EngineKind } from './engines.js';
export { EngineError, engineClient, SglangClient, VllmClient } from './engines.js';
export type { RolloutProgress } from './progress.js';
export type { ProtocolContext } from './protocol.js';
export {
  createProtocol,
  loadProtocol,
  parseToolCalls,
  promptIds,
  promptText,
  toolTurnIds,
} from './protocol.js';
export { type RolloutOptions, rollout } from './runner.js';
export type { Policy } from './scheduler.js';
export { POLICIES, Scheduler } from './scheduler.js';
export type { TextTokenizer } from './tokenizer.js';
export { loadTokenizer } from './tokenizer.js';
export { SESSION_NOTE, TOOL_STATES, type ToolState } from './tool-state.js';
