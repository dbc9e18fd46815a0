"""lancedb imported without running lance_namespace's REST client package body (memlib.io.lance_tables):
a store's tables work, and the client's names still load when something asks for them."""
from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import REPO

_CHILD = """
import json, sys
from pathlib import Path
import pyarrow as pa
from memlib.io.lance_tables import REST_CLIENT, connect
db = connect(Path(sys.argv[1]))
db.create_table("t", pa.table({"a": [1, 2, 3]}))
out = {"rows": db.open_table("t").count_rows(), "api": REST_CLIENT + ".api" in sys.modules}
import lance_namespace_urllib3_client as client
out["asked"] = client.ApiClient.__name__
out["api_after"] = REST_CLIENT + ".api" in sys.modules
print(json.dumps(out))
"""


def test_io_lance_import_defers_the_rest_client_and_loads_it_when_asked(tmp_path):
    (tmp_path / "lance").mkdir()
    res = subprocess.run([sys.executable, "-c", _CHILD, str(tmp_path)], cwd=REPO, capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out == {"rows": 3, "api": False, "asked": "ApiClient", "api_after": True}, out
