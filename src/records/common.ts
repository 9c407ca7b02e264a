import { z } from 'zod';

/** Every record carries its schema version; readers accept a missing `v` as version 1. */
export const version = z.literal(1).default(1);

export const tokenIds = z.array(z.int().nonnegative());
