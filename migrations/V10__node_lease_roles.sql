-- What each leaseholder runs (`serve --role`, `server.roles`): a front stage mints
-- order ids with its leased node id like an engine does, but consumes no order
-- queue, so it must not take a rank when the live engines share the shards among
-- themselves (store::node_lease::live_node_ids). Rows written before this column
-- existed were engines running everything.
SET LOCAL search_path = seckill, public;

ALTER TABLE public.node_lease
    ADD COLUMN roles    text    NOT NULL DEFAULT 'all',
    ADD COLUMN consumes boolean NOT NULL DEFAULT true;
