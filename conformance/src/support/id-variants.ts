/**
 * Strings a store must keep apart although some databases compare them as equal: `base`,
 * with a trailing space, upper-cased, and in Unicode normalisation form D (`base` should
 * contain a precomposed character such as `é`).
 */
export function idVariants(base: string): string[] {
  const variants = [base.normalize('NFC'), `${base.normalize('NFC')} `, base.normalize('NFC').toUpperCase(), base.normalize('NFD')];
  if (new Set(variants).size !== variants.length) throw new Error(`idVariants: ${JSON.stringify(base)} gives equal variants`);
  return variants;
}
