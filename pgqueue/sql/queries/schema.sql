-- Schema introspection used at worker start.

-- name: schema_revision :one
SELECT version_num FROM pgqueue.alembic_version

-- name: schema_exists :one
SELECT to_regclass('pgqueue.alembic_version') IS NOT NULL AS present
