"""Writes valid/large.json: 1,000 tasks (the default limit is 10,000 per batch).

python examples/make_large.py > examples/valid/large.json
"""

import json

TASKS = [
    {
        "task_id": f"task-{number:04d}",
        "title": f"Translate message catalogue {number}",
        "body": f"Translate `messages/{number:04d}.po` into German.",
        "acceptance": ["every message has a translation", "placeholders are kept"],
    }
    for number in range(1, 1001)
]
print(json.dumps({"client_id": "acme", "batch_ref": "translations", "tasks": TASKS}, indent=1))
