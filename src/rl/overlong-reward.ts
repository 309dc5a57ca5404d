// DAPO's soft overlong punishment (Yu et al. 2025, arXiv 2503.14476, §3.4, eq. 13): a
// response that runs into the last L_cache tokens before the length limit L_max is penalised
// in proportion to how far it went, instead of being scored like a finished one:
//
//   R_length(y) = 0                              |y| ≤ L_max − L_cache
//               = ((L_max − L_cache) − |y|)/L_cache   L_max − L_cache < |y| ≤ L_max
//               = −1                             L_max < |y|
//
// added to the task reward. verl's DAPO reward manager (verl/workers/reward_manager/dapo.py,
// volcengine/verl main, 2026-01; keys reward_model.overlong_buffer.{enable,len,penalty_factor})
// computes min(−(|y| − (L_max − L_cache))/L_cache · penalty_factor, 0), the same for
// |y| ≤ L_max (its responses never exceed L_max), with the penalty scaled by penalty_factor.

/**
 * penalty_factor · R_length(length) for the limit maxLength (L_max) and the buffer
 * bufferLength (L_cache, 0 < L_cache ≤ L_max): 0 up to L_max − L_cache, then falling linearly
 * to −penalty_factor at L_max, and −penalty_factor beyond.
 */
export function overlongPenalty(
  length: number,
  maxLength: number,
  bufferLength: number,
  penaltyFactor: number,
): number {
  if (!(bufferLength > 0 && bufferLength <= maxLength)) {
    throw new Error(`overlong buffer: need 0 < len ≤ ${maxLength}, got ${bufferLength}`);
  }
  const exceed = length - (maxLength - bufferLength);
  if (exceed <= 0) return 0;
  return -penaltyFactor * Math.min(exceed / bufferLength, 1);
}
