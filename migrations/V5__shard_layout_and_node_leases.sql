-- The shard layout every producer and engine must agree on (domain::shard): the
-- function's version and the shard count. One row, written by the first engine
-- that starts and changed only by `seckill-engine reshard` once the queues are empty.
CREATE TABLE shard_layout (
    singleton      boolean     PRIMARY KEY DEFAULT true CHECK (singleton),
    shard_function integer     NOT NULL CHECK (shard_function > 0),
    shards         integer     NOT NULL CHECK (shards BETWEEN 1 AND 1024),
    recorded_at    timestamptz NOT NULL DEFAULT now()
);

-- Node ids (domain::ids) leased to live engine instances, so that no two mint the
-- same order or ledger id. Renewed by the database's clock; another instance may
-- take an id only well after its last renewal (store::node_lease).
CREATE TABLE node_lease (
    node_id     smallint    PRIMARY KEY CHECK (node_id BETWEEN 0 AND 1023),
    holder      uuid        NOT NULL,
    holder_name text        NOT NULL,
    renewed_at  timestamptz NOT NULL
);
