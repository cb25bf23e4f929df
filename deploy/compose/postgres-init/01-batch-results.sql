-- Run once by the postgres image on an empty data volume (/docker-entrypoint-initdb.d), as POSTGRES_USER.
-- batch_results is the PostgreSQL publish target (Airflow connection batch_inference_postgres); the
-- Airflow metadata database (airflow) is created by POSTGRES_DB. Separate databases keep a results
-- table swap from ever touching Airflow's own tables.
CREATE DATABASE batch_results;
