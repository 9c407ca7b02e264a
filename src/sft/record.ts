/**
 * What `sft-data` writes: trajectory-shaped, so `train-step --loss sft` reads it as a TrainRecord
 * (`prompt_ids`, `response_ids`, `loss_mask`); `text` is the decoded response for people.
 */
export interface SftRecord {
  v: 1;
  id: string;
  problem_id?: string;
  prompt_ids: number[];
  response_ids: number[];
  /** 1 on assistant tokens (trained), 0 on tool responses and later user turns. */
  loss_mask: (0 | 1)[];
  text: string;
  answer?: string;
  source: string;
}
