import { unwrapText } from './normalize.js';

/**
 * Multiple choice: the letter the answer names. Accepts `C`, `(C)`, `\text{(C)}`, `C)`, `C.`,
 * `\textbf{C}`, `Option C`, `the answer is C`; a bare letter must stand alone, so words that start
 * with a capital (`Carla`) never count as a choice.
 */
const LETTERS = 'A-J';
const ALONE = new RegExp(`^\\(?\\s*([${LETTERS}])\\s*\\)?[.:]?$`);
const PHRASE = new RegExp(
  `(?:answer|option|choice)\\s*(?:is|:)?\\s*:?\\s*\\(?([${LETTERS}])\\b(?![a-z])`,
  'gi',
);
const LEAD = new RegExp(`^\\(?([${LETTERS}])[.):]\\s`);
const STANDALONE = new RegExp(`(?:^|[\\s(\\[{*])\\(?([${LETTERS}])\\)?(?=$|[\\s.,:;)\\]}*])`, 'g');

export function choiceLetter(answer: string): string | null {
  const s = unwrapText(answer)
    .replace(/\$|\\[()[\]]/g, ' ')
    .replace(/\\boxed\s*\{([^{}]*)\}/g, '$1')
    .trim();
  const alone = ALONE.exec(s);
  if (alone) return alone[1].toUpperCase();
  // `A. Because B is not valid`: a response that opens with its choice.
  const lead = LEAD.exec(s);
  if (lead) return lead[1];
  let last: string | null = null;
  PHRASE.lastIndex = 0;
  for (let m = PHRASE.exec(s); m !== null; m = PHRASE.exec(s)) last = m[1].toUpperCase();
  if (last !== null) return last;
  // Short answers only: in long prose a lone capital letter is more likely a point or a name.
  if (s.length > 40) return null;
  STANDALONE.lastIndex = 0;
  for (let m = STANDALONE.exec(s); m !== null; m = STANDALONE.exec(s)) last = m[1];
  return last;
}
