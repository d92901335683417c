-- Kinds the Go client refuses are refused by the SQL API too (found by an
-- adversarial review, 2026-12-03). ValidateKind refuses what Go's unicode
-- package calls a space or not printable; the SQL check was
-- [[:space:][:cntrl:]], which under the C.UTF-8 locale (and others) lets
-- through U+00A0, U+2007, U+202F, U+200B, U+00AD, U+FEFF, private-use
-- characters and U+FFF9: enqueue() wrote jobs of a kind no client can
-- register a handler for (queue.New refuses it), so they could only end
-- ErrUnknownKind. The class now names every assigned character of the
-- categories Cc, Cf, Co, Zs, Zl and Zp (Unicode 15, generated from Go's
-- tables) besides the locale's classes. Unassigned code points, which Go
-- also refuses, cannot be named in SQL: they still pass here (docs/sql.md).
--
-- valid_job: migration 0023's, with that kind check.
CREATE OR REPLACE FUNCTION {{schema}}.valid_job(ord bigint, k text, p jsonb, q text, ra timestamptz, d interval,
    pr integer, ma integer, uk text, payload_limit integer) RETURNS boolean
LANGUAGE sql VOLATILE
AS $$
SELECT CASE WHEN
        (q IS NULL OR (q OPERATOR(pg_catalog.<>) '' AND pg_catalog.octet_length(q) OPERATOR(pg_catalog.<=) 63
            AND q OPERATOR(pg_catalog.~) '^[a-z0-9][a-z0-9_.-]*$'))
        AND k IS NOT NULL AND k OPERATOR(pg_catalog.<>) '' AND pg_catalog.octet_length(k) OPERATOR(pg_catalog.<=) 255
        AND k OPERATOR(pg_catalog.!~) '[[:space:][:cntrl:]\u00a0\u00ad\u0600-\u0605\u061c\u06dd\u070f\u0890-\u0891\u08e2\u1680\u180e\u2000-\u200f\u2028-\u202f\u205f-\u2064\u2066-\u206f\u3000\ue000-\uf8ff\ufeff\ufff9-\ufffb\U000110bd\U000110cd\U00013430-\U0001343f\U0001bca0-\U0001bca3\U0001d173-\U0001d17a\U000e0001\U000e0020-\U000e007f\U000f0000-\U000ffffd\U00100000-\U0010fffd]'
        AND (p IS NULL OR payload_limit IS NULL
            OR pg_catalog.octet_length(p::pg_catalog.text) OPERATOR(pg_catalog.<=) payload_limit)
        AND (pr IS NULL OR (pr OPERATOR(pg_catalog.>=) -32768 AND pr OPERATOR(pg_catalog.<=) 32767))
        AND (ra IS NULL OR (ra OPERATOR(pg_catalog.>=) '0001-01-01 00:00:00+00'::pg_catalog.timestamptz
            AND ra OPERATOR(pg_catalog.<) '10000-01-01 00:00:00+00'::pg_catalog.timestamptz))
        AND (ra IS NOT NULL OR d IS NULL OR (pg_catalog.isfinite(d) AND d OPERATOR(pg_catalog.>=) interval '0'
            AND d OPERATOR(pg_catalog.<) interval '7000 years'))
        AND (ma IS NULL OR ma OPERATOR(pg_catalog.>=) 1)
        AND (uk IS NULL OR pg_catalog.octet_length(uk) OPERATOR(pg_catalog.<=) 1024)
    THEN true
    ELSE {{schema}}.job_error(ord, k, p, q, ra, d, pr, ma, uk, payload_limit) END
$$;

-- job_error: migration 0023's, with the kind check above.
CREATE OR REPLACE FUNCTION {{schema}}.job_error(ord bigint, k text, p jsonb, q text, ra timestamptz, d interval,
    pr integer, ma integer, uk text, payload_limit integer) RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    lands timestamptz;
BEGIN
    IF q IS NOT NULL AND (q = '' OR pg_catalog.octet_length(q) > 63 OR q !~ '^[a-z0-9][a-z0-9_.-]*$') THEN
        RETURN {{schema}}.invalid('PW002', ord, 'queue', pg_catalog.format('invalid queue name %L: 1 to 63 bytes of lowercase letters, digits, ''_'', ''.'', ''-'', starting with a letter or digit', q));
    ELSIF k IS NULL OR k = '' THEN
        RETURN {{schema}}.invalid('PW001', ord, 'kind', 'invalid kind: empty');
    ELSIF pg_catalog.octet_length(k) > 255 THEN
        RETURN {{schema}}.invalid('PW001', ord, 'kind', pg_catalog.format('invalid kind: %s bytes, the limit is 255', pg_catalog.octet_length(k)));
    ELSIF k ~ '[[:space:][:cntrl:]\u00a0\u00ad\u0600-\u0605\u061c\u06dd\u070f\u0890-\u0891\u08e2\u1680\u180e\u2000-\u200f\u2028-\u202f\u205f-\u2064\u2066-\u206f\u3000\ue000-\uf8ff\ufeff\ufff9-\ufffb\U000110bd\U000110cd\U00013430-\U0001343f\U0001bca0-\U0001bca3\U0001d173-\U0001d17a\U000e0001\U000e0020-\U000e007f\U000f0000-\U000ffffd\U00100000-\U0010fffd]' THEN
        RETURN {{schema}}.invalid('PW001', ord, 'kind', pg_catalog.format('invalid kind %L: use printable characters without spaces', k));
    ELSIF p IS NOT NULL AND payload_limit IS NOT NULL AND pg_catalog.octet_length(p::text) > payload_limit THEN
        RETURN {{schema}}.invalid('PW003', ord, 'payload', pg_catalog.format('payload too large: %s bytes, the limit is %s', pg_catalog.octet_length(p::text), payload_limit));
    ELSIF pr IS NOT NULL AND (pr < -32768 OR pr > 32767) THEN
        RETURN {{schema}}.invalid('PW004', ord, 'priority', pg_catalog.format('priority out of range: %s is outside -32768..32767', pr));
    ELSIF ra IS NOT NULL AND NOT pg_catalog.isfinite(ra) THEN
        RETURN {{schema}}.invalid('PW005', ord, 'run_after', pg_catalog.format('invalid schedule: run_after %s is not a finite time', ra));
    ELSIF ra IS NOT NULL AND (ra < '0001-01-01 00:00:00+00' OR ra >= '10000-01-01 00:00:00+00') THEN
        RETURN {{schema}}.invalid('PW005', ord, 'run_after', pg_catalog.format('invalid schedule: run_after %s is outside years 1 to 9999 (UTC)', ra));
    ELSIF ra IS NULL AND d IS NOT NULL AND (NOT pg_catalog.isfinite(d) OR d < interval '0') THEN
        RETURN {{schema}}.invalid('PW005', ord, 'delay', pg_catalog.format('invalid schedule: delay %s is negative or infinite', d));
    ELSIF ma IS NOT NULL AND ma < 1 THEN
        RETURN {{schema}}.invalid('PW006', ord, 'max_attempts', pg_catalog.format('max attempts must be at least 1: got %s', ma));
    ELSIF uk IS NOT NULL AND pg_catalog.octet_length(uk) > 1024 THEN
        RETURN {{schema}}.invalid('PW007', ord, 'unique_key', pg_catalog.format('invalid unique key: %s bytes, the limit is 1024', pg_catalog.octet_length(uk)));
    END IF;
    IF ra IS NULL AND d IS NOT NULL THEN
        BEGIN
            lands := pg_catalog.now() + d;
        EXCEPTION WHEN datetime_field_overflow THEN
            lands := 'infinity';
        END;
        IF lands >= '10000-01-01 00:00:00+00' THEN
            RETURN {{schema}}.invalid('PW005', ord, 'delay', pg_catalog.format('invalid schedule: delay %s puts run_after past year 9999', d));
        END IF;
    END IF;
    RETURN true;
END
$$;

