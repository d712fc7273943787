"""Create the database named by DATABASE_URL if it does not exist yet."""

import os
import sys

import dj_database_url
import psycopg2
from psycopg2 import sql

url = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/renq")
cfg = dj_database_url.parse(url)
conn = psycopg2.connect(
    dbname="postgres",
    user=cfg["USER"] or "postgres",
    password=cfg["PASSWORD"] or None,
    host=cfg["HOST"] or "127.0.0.1",
    port=cfg["PORT"] or 5432,
)
conn.autocommit = True
with conn.cursor() as cur:
    cur.execute("SELECT 1 FROM pg_database WHERE datname = %s", [cfg["NAME"]])
    if cur.fetchone() is None:
        cur.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(cfg["NAME"])))
        print(f"created database {cfg['NAME']}", file=sys.stderr)
