#!/usr/bin/env python3
"""The cluster page in a real browser (Debian's chromium through
chromium-driver and selenium; scripts/test.sh installs them).

    page_test.py split URL --kill-pid PID --shots DIR
        rec split over node-a and node-b (node-c spare): the cluster view
        lists the three workers, the model view draws subgraph boxes on
        node-a and node-b and opens one's nodes; the live view's
        requests/s moves while a load runs through the front door; the
        worker with PID, killed, shows as lost within 3 s, and the picture
        is drawn again without it after the re-plan.
    page_test.py playground URL --model NAME --folder DIR --shots DIR
        The playground's text at temperature 0 equals onnxruntime-genai's
        greedy text on the same folder.
    page_test.py tokens URL --token TOKEN --shots DIR
        With tokens on: without one the page asks for it and shows no
        data, the API answers 401; with it the cluster shows.

Screenshots of each view go to --shots (test artifacts, not committed).
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

HERE = os.path.dirname(os.path.abspath(__file__))


def browser():
    options = Options()
    options.binary_location = os.environ.get("CHROMIUM", "/usr/bin/chromium")
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                "--disable-gpu", "--window-size=1500,1000"):
        options.add_argument(arg)
    driver = os.environ.get("CHROMEDRIVER", "/usr/bin/chromedriver")
    return webdriver.Chrome(service=Service(executable_path=driver), options=options)


def wait(driver, what, condition, timeout=30):
    try:
        return WebDriverWait(driver, timeout, poll_frequency=0.1).until(lambda d: condition(d))
    except Exception as e:
        raise AssertionError(f"timed out waiting for {what}: {e}") from e


def shot(driver, shots, name):
    os.makedirs(shots, exist_ok=True)
    path = os.path.join(shots, name)
    driver.save_screenshot(path)
    print("screenshot", path)


def worker_states(driver):
    # Read in the page: the cards are drawn again twice a second.
    return driver.execute_script(
        "return Object.fromEntries([...document.querySelectorAll('#workers .card.worker')]"
        ".map(c => [c.dataset.worker, c.dataset.state]));")


def boxes(driver):
    return driver.find_elements(By.CSS_SELECTOR, "#model-picture g.subgraph")


def box_hosts(driver):
    return sorted(set(driver.execute_script(
        "return [...document.querySelectorAll('#model-picture g.subgraph')].map(b => b.dataset.host);")))


def show(driver, url, view):
    driver.get(f"{url}/#{view}")
    wait(driver, f"the {view} view", lambda d: d.find_element(By.ID, f"view-{view}").is_displayed())


def infer_forever(url, stop, counts):
    body = json.dumps({"inputs": [{
        "name": "x", "datatype": "FP32", "shape": [1, 3, 48, 320],
        "data": [0.5] * (3 * 48 * 320)}]}).encode()
    while not stop.is_set():
        request = urllib.request.Request(f"{url}/v2/models/rec/infer", data=body,
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=30) as r:
                r.read()
                counts["ok"] += 1
        except Exception as e:  # noqa: BLE001: counted, the page shows them
            counts["failed"] += 1
            counts["last"] = str(e)


def split(args):
    driver = browser()
    try:
        show(driver, args.url, "cluster")
        wait(driver, "three ready workers",
             lambda d: worker_states(d) == {"node-a": "ready", "node-b": "ready", "node-c": "ready"})
        bars = driver.find_elements(By.CSS_SELECTOR, "#workers .bar .stages")
        assert bars, "no memory bars"
        shot(driver, args.shots, "cluster.png")

        driver.find_element(By.CSS_SELECTOR, 'nav a[data-view="model"]').click()
        wait(driver, "rec's picture on node-a and node-b",
             lambda d: {"node-a", "node-b"} <= set(box_hosts(d)))
        print("model view: boxes on", box_hosts(driver), "from", len(boxes(driver)), "boxes")
        boxes(driver)[0].click()
        wait(driver, "a subgraph's nodes",
             lambda d: len(d.find_elements(By.CSS_SELECTOR, "#subgraph-nodes tbody tr")) > 0)
        first = driver.find_elements(By.CSS_SELECTOR, "#subgraph-nodes tbody tr td")
        assert first[1].text, "a node without its op type"
        shot(driver, args.shots, "model.png")

        # The live view while a load runs.
        driver.find_element(By.CSS_SELECTOR, 'nav a[data-view="live"]').click()
        stop, counts = threading.Event(), {"ok": 0, "failed": 0}
        loads = [threading.Thread(target=infer_forever, args=(args.url, stop, counts)) for _ in range(2)]
        for t in loads:
            t.start()
        try:
            def rps(d):
                # Read in the page: the table is drawn again every second.
                value = d.execute_script(
                    "const c = document.getElementById('live-rps-rec'); return c && c.dataset.value;")
                return float(value or 0)
            wait(driver, "requests/s to move", lambda d: rps(d) > 0, timeout=30)
            print(f"live: {rps(driver)} requests/s on the cluster ({counts['ok']} answered so far)")
            time.sleep(2)
            shot(driver, args.shots, "live.png")
        finally:
            stop.set()
            for t in loads:
                t.join()
        assert counts["failed"] == 0, counts

        # The playground runs rec on random inputs and shows its output.
        driver.find_element(By.CSS_SELECTOR, 'nav a[data-view="playground"]').click()
        wait(driver, "rec's inputs", lambda d: d.find_element(By.ID, "play-infer").is_displayed())
        driver.find_element(By.ID, "play-infer-run").click()
        out = driver.find_element(By.ID, "play-outputs")
        wait(driver, "rec's outputs", lambda d: out.get_attribute("data-done") == "1")
        print("playground:", out.text.splitlines()[0])
        assert "FP32 [1,40,6625]" in out.text, out.text
        shot(driver, args.shots, "playground-rec.png")

        # A killed worker shows as lost within 3 s; the picture is drawn again.
        driver.find_element(By.CSS_SELECTOR, 'nav a[data-view="cluster"]').click()
        os.kill(args.kill_pid, signal.SIGKILL)
        killed = time.monotonic()
        wait(driver, "node-b lost", lambda d: worker_states(d).get("node-b") == "lost", timeout=10)
        lost_after = time.monotonic() - killed
        print(f"node-b shown lost {lost_after:.2f} s after SIGKILL")
        assert lost_after <= 3.0, f"lost after {lost_after:.2f} s"
        shot(driver, args.shots, "lost.png")
        driver.find_element(By.CSS_SELECTOR, 'nav a[data-view="model"]').click()
        wait(driver, "the picture without node-b",
             lambda d: box_hosts(d) and "node-b" not in box_hosts(d), timeout=60)
        print("after the re-plan: boxes on", box_hosts(driver))
        shot(driver, args.shots, "model-healed.png")
    finally:
        driver.quit()


def genai_text(folder, prompt, max_new):
    script = os.path.join(HERE, "..", "..", "scripts", "llm", "genai_generate.py")
    out = subprocess.run([sys.executable, script, folder, "--max-new", str(max_new), prompt],
                         check=True, capture_output=True, text=True)
    return json.loads(out.stdout.splitlines()[0])["text"]


def playground(args):
    prompt, max_new = "Once upon a time", 24
    want = genai_text(args.folder, prompt, max_new)
    driver = browser()
    try:
        show(driver, args.url, "playground")
        wait(driver, "the generation form", lambda d: d.find_element(By.ID, "play-generate").is_displayed())
        select = driver.find_element(By.ID, "play-model")
        assert select.get_attribute("value") == args.model, select.get_attribute("value")
        for field, value in (("prompt", prompt), ("max-tokens", str(max_new)), ("temperature", "0")):
            box = driver.find_element(By.ID, field)
            box.clear()
            box.send_keys(value)
        driver.find_element(By.ID, "play-generate-run").click()
        out = driver.find_element(By.ID, "play-text")
        wait(driver, "the generation to end", lambda d: out.get_attribute("data-done") == "1", timeout=120)
        got = driver.execute_script("return document.getElementById('play-text').textContent")
        print(f"playground: {got!r}\nonnxruntime-genai: {want!r}")
        assert got == want, (got, want)
        shot(driver, args.shots, "playground.png")
        # A model of thousands of nodes draws as subgraphs, fast.
        started = time.monotonic()
        driver.find_element(By.CSS_SELECTOR, 'nav a[data-view="model"]').click()
        wait(driver, "the model's picture", lambda d: len(boxes(d)) > 0)
        shown = time.monotonic() - started
        draw_ms = float(driver.find_element(By.ID, "model-picture").get_attribute("data-draw-ms"))
        nodes = driver.execute_script(
            "return state.models.find(m => m.name === arguments[0]).plan.subgraphs"
            ".reduce((n, s) => n + s.nodes, 0)", args.model)
        print(f"model view: {nodes} nodes in {len(boxes(driver))} boxes, drawn in {draw_ms} ms, "
              f"shown {shown:.2f} s after the click")
        assert nodes > 500, nodes
        assert draw_ms < 1000 and shown < 1.0, (draw_ms, shown)
        shot(driver, args.shots, "model-llm.png")
    finally:
        driver.quit()


def tokens(args):
    try:
        urllib.request.urlopen(f"{args.url}/api/cluster", timeout=10)
        raise AssertionError("/api/cluster answered without a token")
    except urllib.error.HTTPError as e:
        assert e.code == 401, e.code
    driver = browser()
    try:
        driver.get(args.url + "/")
        wait(driver, "the token prompt", lambda d: d.find_element(By.ID, "login").is_displayed())
        assert not driver.find_element(By.ID, "views").is_displayed(), "data shown without a token"
        assert driver.find_elements(By.CSS_SELECTOR, "#workers .card") == [], "worker cards without a token"
        shot(driver, args.shots, "token-prompt.png")
        box = driver.find_element(By.ID, "token")
        box.send_keys("not-the-token")
        driver.find_element(By.CSS_SELECTOR, "#login-form button").click()
        wait(driver, "a refused token", lambda d: "not accepted" in d.find_element(By.ID, "login-error").text)
        box = driver.find_element(By.ID, "token")
        box.clear()
        box.send_keys(args.token)
        driver.find_element(By.CSS_SELECTOR, "#login-form button").click()
        wait(driver, "the workers with the token", lambda d: len(worker_states(d)) == 2)
        print("with the token:", worker_states(driver))
    finally:
        driver.quit()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["split", "playground", "tokens"])
    parser.add_argument("url")
    parser.add_argument("--shots", required=True)
    parser.add_argument("--kill-pid", type=int)
    parser.add_argument("--model")
    parser.add_argument("--folder")
    parser.add_argument("--token")
    args = parser.parse_args()
    args.url = args.url.rstrip("/")
    {"split": split, "playground": playground, "tokens": tokens}[args.mode](args)
    print("page test", args.mode, "passed")


if __name__ == "__main__":
    main()
