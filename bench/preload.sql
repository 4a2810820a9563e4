-- bench/preload.sql: server-side generation of the drain backlog for
-- scripts/bench.sh. CALL bench_preload(n_events, txn_rows) inserts n_events
-- outbox rows (~250-byte JSON payloads) in transactions of txn_rows rows.
--
-- A procedure, because only a procedure (or DO block) may COMMIT inside a
-- loop: one call produces a million separate transactions without a client
-- round trip per transaction, so the preload is quick even for 1-row ones.
CREATE OR REPLACE PROCEDURE bench_preload(n_events bigint, txn_rows int)
LANGUAGE plpgsql AS $$
DECLARE
    done bigint := 0;
    k int;
BEGIN
    WHILE done < n_events LOOP
        k := least(txn_rows, n_events - done);
        INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload)
        SELECT gen_random_uuid(), 'order', (g % 100000)::text, 'OrderCreated',
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
