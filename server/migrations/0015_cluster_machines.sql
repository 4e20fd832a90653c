-- The Ray cluster's machines as it last listed them (inventory::ray::ClusterMachine, JSON): a server started
-- while the cluster does not answer shows them, unreachable, and follows them once it answers.
CREATE TABLE cluster_machines (
    name    TEXT PRIMARY KEY,
    machine TEXT NOT NULL CHECK (json_valid(machine))
);
