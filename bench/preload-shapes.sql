-- bench/preload-shapes.sql: server-side backlogs for the opt-in shapes of
-- scripts/bench.sh (--shapes), beside bench/preload.sql (the drain rounds').
-- Procedures for the same reason as there: a COMMIT every txn_rows rows
-- without a client round trip per transaction.

-- CALL bench_preload_payload(n_events, txn_rows, payload_bytes): payloads of
-- about payload_bytes bytes of JSON text each. The bulk is hex text that
-- differs from row to row (md5 of the row number and a counter), so that
-- neither pglz (TOAST compression) nor the relay's LZ4 batches can shrink it
-- much: from about 2 KB up, the value is stored out of line (TOASTed), and
-- the figure measures moving bytes, not compressing repeats.
CREATE OR REPLACE PROCEDURE bench_preload_payload(n_events bigint, txn_rows int, payload_bytes int)
LANGUAGE plpgsql AS $$
DECLARE
    done bigint := 0;
    k int;
    -- {"blob": "<hex>", "order_id": <g>}: ~35 bytes besides the hex.
    chunks int := greatest(1, (payload_bytes - 35) / 32);
BEGIN
    WHILE done < n_events LOOP
        k := least(txn_rows, n_events - done);
        INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload)
        SELECT gen_random_uuid(), 'order', (g % 100000)::text, 'OrderCreated',
               jsonb_build_object(
                   'order_id', g,
                   'blob', (SELECT string_agg(md5(g::text || '.' || i::text), '')
                            FROM generate_series(1, chunks) AS i))
        FROM generate_series(done + 1, done + k) AS g;
        COMMIT;
        done := done + k;
    END LOOP;
END
$$;

-- CALL bench_preload_types(n_events, txn_rows, n_types): the payloads of
-- bench_preload (~258 bytes), with aggregate types a0 .. a<n_types - 1> in
-- turn, so that a topic template with {aggregatetype} spreads the events over
-- n_types topics (consecutive rows go to different topics).
CREATE OR REPLACE PROCEDURE bench_preload_types(n_events bigint, txn_rows int, n_types int)
LANGUAGE plpgsql AS $$
DECLARE
    done bigint := 0;
    k int;
BEGIN
    WHILE done < n_events LOOP
        k := least(txn_rows, n_events - done);
        INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload)
        SELECT gen_random_uuid(), 'a' || (g % n_types)::text, (g % 100000)::text, 'OrderCreated',
               jsonb_build_object(
                   'order_id', g, 'customer_id', 'c-' || (g % 9973), 'status', 'created',
                   'currency', 'EUR', 'total_cents', (g * 7919) % 100000,
                   'lines', jsonb_build_array(
                       jsonb_build_object('sku', md5(g::text), 'qty', g % 5 + 1),
                       jsonb_build_object('sku', md5((g + 1)::text), 'qty', g % 3 + 1)),
                   'note', 'pad-250-bytes-of-json.')
        FROM generate_series(done + 1, done + k) AS g;
        COMMIT;
        done := done + k;
    END LOOP;
END
$$;
