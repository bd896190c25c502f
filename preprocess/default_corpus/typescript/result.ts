export type Result<T, E = Error> = { ok: true; value: T } | { ok: false; error: E };

export function ok<T>(value: T): Result<T, never> {
  return { ok: true, value };
}

export function err<E>(error: E): Result<never, E> {
  return { ok: false, error };
}

export function parseIntStrict(text: string): Result<number, string> {
  if (!/^-?\d+$/.test(text)) {
    return err(`not an integer: ${JSON.stringify(text)}`);
  }
  return ok(Number.parseInt(text, 10));
}

export function collect<T, E>(results: Result<T, E>[]): Result<T[], E> {
  const values: T[] = [];
  for (const r of results) {
    if (!r.ok) {
      return r;
    }
    values.push(r.value);
  }
  return ok(values);
}
