"""A FastAPI service that takes orders and sends their receipts in the background.

``POST /orders`` writes the order and enqueues its receipt in one AsyncSession: the
job exists if and only if the order does (an order refused after the enqueue, as one
of quantity 0 is, takes its job with it). A worker runs the receipts. From the
repository's root, with ``pip install 'ferryq[sqlalchemy]' aiosqlite`` (SQLite) or
``'ferryq[sqlalchemy,postgres]'`` (PostgreSQL):

    export FERRYQ_URL=sqlite:///shop.db          # or postgresql://localhost/shop
    uvicorn examples.fastapi_sqlalchemy.api:api  # the service
    ferryq worker examples.fastapi_sqlalchemy.jobs:queue

    curl -X POST localhost:8000/orders -H 'content-type: application/json' \\
         -d '{"item": "tea", "quantity": 2}'
    curl localhost:8000/orders/1                 # "receipt_sent": true, once run
"""
