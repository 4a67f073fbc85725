"""Admission: which waiting job may take its GPUs now, within every team's quota and what it may borrow.

Airflow's GPU pool of a type bounds the GPUs in use (a training task holds pool_slots = its GPUs), but a
pool knows nothing of teams, and when the first waiting task does not fit it starts smaller ones behind
it, so a large job can wait forever. The ledger here adds what pools lack, and nothing else:

* a job's training starts only once the ledger admits it; the ``admit`` task of ``train_pipeline`` waits
  for that deferred, its looks made by a trigger in Airflow's triggerer (no worker held or started while
  it waits; ``trainyard_airflow.triggers.admission``);
* never more slots of a type admitted than it has; a team never above its quota plus what it may borrow;
  borrowing only from what other teams lend of their idle quota and from slots in nobody's quota, and
  what a team does not lend stays its own: a lender taking its lent quota back waits for the borrowers
  to finish rather than take another team's reserve (``ResourcesConfig.lent``);
* order among waiting jobs of a type: a job that waited ``scheduling.max_wait_minutes`` first; then jobs
  within their team's quota before jobs that would borrow; then ``resources.priority``; then arrival;
* a job that does not fit does not stop smaller ones behind it (backfill: the fleet stays busy), except
  that (a) behind a job within its quota that waits for slots, no job may borrow (lent quota comes back as
  the borrowers finish; nothing running is preempted), and (b) a job that has waited
  ``max_wait_minutes`` for slots holds a reservation: the time by which enough slots are free for it if
  every running job ends by its ``max_hours`` (``policy._reserved_start``). No job that would borrow and no
  job of its own team starts if it could keep it from starting then (``policy._would_delay``): one that ends
  by then at the latest, or leaves it room then by every limit, still does (EASY backfill, as in Slurm);
  other teams keep their own quota. So it starts by its reservation at the latest, sooner as running jobs
  end early: the bound on how long a large job waits behind a stream of small ones, without the fleet
  idling while it drains;
* a team's admitted jobs' commitments (each a worst case, price x max_hours x slots, less what its run
  spent) stay within what its monthly budget has left after the month's spend.

Three parts, each its own module: the policy (:mod:`.policy`: pure, given the fleet, the teams and the
entries, a typed verdict per job), the ledger (:mod:`.ledger`: the entries in SQLite or PostgreSQL, each
decision one transaction) and the lease (:mod:`.lease`: a training's hold on its admission, its heartbeat
and reclaim). Import from those modules; this package holds no code.

Every decision is one transaction that no other decision interleaves with, so concurrent task processes
see one order: on a SQLite file of this host (the embedded default) or on a PostgreSQL database that every
host reaches (``TRAINYARD_DATABASE_URL``, the cluster profile); :mod:`trainyard.scheduling.ledger_db`.

Nothing leaks when a process dies: every row has a lease. A waiting job's lease is renewed by
each look of its ``admit`` task (its trigger), an admitted job's by its training task (:func:`.lease.hold`, a heartbeat
thread); a row whose lease ran out is dropped by the next decision, so a killed worker, a cancelled run or
a crashed scheduler frees its slots within one lease. A job's arrival is kept apart from its lease, so a
missed look or a retried training keeps its place in the queue. A SQLite file must be on a local disk
(SQLite's locking does not hold on network filesystems): one host, as with Airflow's LocalExecutor; workers
on several hosts share the PostgreSQL ledger, whose leases are judged by the database server's clock.
"""
