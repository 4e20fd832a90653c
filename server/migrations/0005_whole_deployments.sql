-- A model deployed on whole GPUs (the wizard with GPU sharing off) runs as a worker that names its catalog
-- model, with the deployment's own extra arguments (a JSON array) beside the worker's environment.
ALTER TABLE workers ADD COLUMN model TEXT REFERENCES models (name);
ALTER TABLE workers ADD COLUMN args TEXT NOT NULL DEFAULT '[]';
