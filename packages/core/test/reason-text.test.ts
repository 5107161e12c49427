import { describe, expect, it } from 'vitest';
import { boundReason, boundReasonText, boundText, REASON_LIMITS, sanitizeText, unstorableCharacter } from '../src/index.js';

describe('reason text', () => {
  it('replaces U+0000 and lone surrogates, keeping pairs', () => {
    expect(sanitizeText('a\u0000b\uD800c😀\uDC00d')).toBe('a\uFFFDb\uFFFDc😀\uFFFDd');
    expect(sanitizeText('plain é 😀')).toBe('plain é 😀');
    expect(unstorableCharacter('ab\uDC00')).toBe('a lone surrogate U+DC00 at index 2');
    expect(unstorableCharacter('x\u0000')).toBe('U+0000 (NUL) at index 1');
    expect(unstorableCharacter('😀')).toBeUndefined();
  });

  it('cuts on a character boundary, says so, and stays within the limit', () => {
    const text = 'é'.repeat(3000) + '😀'.repeat(10) + '\u0000';
    const cut = boundReasonText(text);
    expect(Buffer.byteLength(cut, 'utf8')).toBeLessThanOrEqual(REASON_LIMITS.messageBytes);
    expect(cut).toMatch(/ … \[cut: 6043 bytes\]$/);
    expect(cut.startsWith('é'.repeat(2000))).toBe(true);
    expect(cut).not.toContain('\uFFFD');
    expect(boundReasonText(cut)).toBe(cut);
  });

  it('passes text at exactly the limit unchanged', () => {
    const exact = '😀'.repeat(REASON_LIMITS.messageBytes / 4);
    expect(boundReasonText(exact)).toBe(exact);
    const reason = { code: 'X', message: exact };
    expect(boundReason(reason)).toBe(reason);
    expect(boundText('x'.repeat(50), 10)).toBe('x'.repeat(10));
  });

  it('bounds the code too', () => {
    const bounded = boundReason({ code: 'C'.repeat(1000), message: 'm\u0000' });
    expect(Buffer.byteLength(bounded.code)).toBeLessThanOrEqual(REASON_LIMITS.codeBytes);
    expect(bounded.message).toBe('m\uFFFD');
  });
});
