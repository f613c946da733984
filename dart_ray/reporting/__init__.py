"""What a run reports: `report.json`, the table, `curve.png`, `system.png`, TensorBoard.

- `summary`: the `RunReport` record (the lowest module: no dart-ray imports).
- `plots`: matplotlib figures and the interval arithmetic (Wilson, difference of rates).
- `figures`: a report's figures from its record and the log.
- `report`: builds the record from a finished run's parts and the log, renders and writes it.
- `plain`: output to a file (a job's log) without terminal colour codes.

May import the store, the data schema and the evaluation's result type; never the run
(`run.runtime.Parts` only for type checking).
"""
