/**
 * `--tool-state stateless|session`: whether a trajectory's tool calls share one Python session
 * (variables, imports, functions and files persist from call to call, as in a notebook) or each
 * call starts a fresh interpreter (the release). The one owner of what the model is told about
 * it: rollout, eval and sft-data all describe the tool through `describeToolState`, so SFT
 * demonstrations and RL prompts agree for the same mode. A leaf: it imports nothing.
 */
export const TOOL_STATES = ['stateless', 'session'] as const;
export type ToolState = (typeof TOOL_STATES)[number];

/**
 * The sentence appended to every tool's description in session mode. Stateless mode adds
 * nothing: its prompts stay byte-identical to the release's (a call starting fresh is what the
 * description already implies).
 */
export const SESSION_NOTE =
  'Variables, imports, functions and files persist between the calls of one conversation: each call runs as the next cell of the same Python session.';

interface DescribedTool {
  function: { description?: string };
}

/** The tool schemas as the model sees them under `state`: session mode appends `SESSION_NOTE`. */
export function describeToolState<T extends DescribedTool>(tools: readonly T[], state: ToolState): T[] {
  if (state === 'stateless') return [...tools];
  return tools.map((t) => {
    const description = t.function.description;
    return {
      ...t,
      function: { ...t.function, description: description ? `${description} ${SESSION_NOTE}` : SESSION_NOTE },
    };
  });
}
