"""Unknown XML attributes and elements are refused, naming the typo and the closest
known name, while every attribute MSCCL and msccl-tools write still loads."""
import glob
import re
from pathlib import Path

import pytest

from gc3.errors import IRFormatError
from gc3.ir.xml_io import from_xml, read_xml

ROOT = Path(__file__).resolve().parents[1]
MSCCL_SAMPLES = sorted(glob.glob("/work/shared/msccl_xml_samples/*.xml"))
RING = (ROOT / "ir_samples" / "allreduce_ring_4r_Simple.xml")

# An msccl-tools style program whose <algo> carries every attribute MSCCL's reader knows.
MSCCL_ALL = ('<algo name="a" proto="Simple" nchannels="1" nchunksperloop="2" ngpus="2" coll="allgather" '
             'inplace="0" outofplace="1" minBytes="0" maxBytes="1099511627776" redop="nop">\n'
             '<gpu id="0" i_chunks="1" o_chunks="2" s_chunks="0">\n'
             '<tb id="0" send="1" recv="1" chan="0">\n'
             '<step s="0" type="s" srcbuf="i" srcoff="0" dstbuf="o" dstoff="0" cnt="1" depid="-1" deps="-1" '
             'hasdep="0"/>\n'
             '<step s="1" type="r" srcbuf="o" srcoff="1" dstbuf="o" dstoff="1" cnt="1" depid="-1" deps="-1" '
             'hasdep="0"/>\n'
             '</tb></gpu>\n'
             '<gpu id="1" i_chunks="1" o_chunks="2" s_chunks="0">\n'
             '<tb id="0" send="0" recv="0" chan="0">\n'
             '<step s="0" type="s" srcbuf="i" srcoff="0" dstbuf="o" dstoff="1" cnt="1" depid="-1" deps="-1" '
             'hasdep="0"/>\n'
             '<step s="1" type="r" srcbuf="o" srcoff="0" dstbuf="o" dstoff="0" cnt="1" depid="-1" deps="-1" '
             'hasdep="0"/>\n'
             '</tb></gpu></algo>')


def _ring_text() -> str:
    for p in sorted((ROOT / "ir_samples").glob("allreduce_ring*.xml")):
        return p.read_text()
    raise AssertionError("ir_samples has no allreduce ring")


@pytest.mark.parametrize("path", MSCCL_SAMPLES + sorted(glob.glob(str(ROOT / "ir_samples" / "*.xml"))))
def test_msccl_and_shipped_samples_still_load(path):
    assert read_xml(path).gpus


def test_every_msccl_algo_attribute_loads():
    prog = from_xml(MSCCL_ALL)
    assert prog.maxBytes == 1 << 40 and prog.outofplace and prog.redop == "nop"


@pytest.mark.parametrize("old, new, message", [
    # misspelt optional attributes would otherwise silently take their default
    (' coll=', ' maxbytes="10" coll=', "`maxbytes`: unknown attribute of `<algo>`; did you mean `maxBytes`?"),
    (' coll=', ' outofplce="0" coll=', "`outofplce`: unknown attribute of `<algo>`; did you mean "
                                                 "`outofplace`?"),
    ('hasdep=', 'hasdeps=', "`hasdeps`: unknown attribute of `<step>`; did you mean `hasdep`?"),
    ('hasdep=', 'hsadep=', "`hsadep`: unknown attribute of `<step>`; did you mean `hasdep`?"),
    ('chan=', 'chna=', "`chna`: unknown attribute of `<tb>`; did you mean `chan`?"),
    ('s_chunks=', 's_chunk=', "`s_chunk`: unknown attribute of `<gpu>`; did you mean `s_chunks`?"),
    # nothing close: the message lists what the element takes
    (' coll=', ' foo="1" coll=', "`foo`: unknown attribute of `<algo>` (it takes coll,"),
])
def test_unknown_attribute_names_the_typo_and_the_closest_name(old, new, message):
    text = _ring_text().replace(old, new, 1)
    assert text != _ring_text()
    with pytest.raises(IRFormatError) as err:
        from_xml(text, source="ring.xml")
    assert message in str(err.value)
    assert re.search(r"ring\.xml:\d+: ", str(err.value)), "the message names the file and line"


def test_unknown_element_names_it_and_the_closest_name():
    text = _ring_text().replace("<step ", "<stpe ", 1)
    text = text.replace("/>", "></stpe>", 1)
    with pytest.raises(IRFormatError) as err:
        from_xml(text, source="ring.xml")
    assert "`<stpe>`: unknown element inside `<tb>`; did you mean `<step>`?" in str(err.value)
    post = _ring_text().replace("</algo>", "<postcondtion/></algo>")
    with pytest.raises(IRFormatError) as err:
        from_xml(post, source="ring.xml")
    assert "`<postcondtion>`: unknown element inside `<algo>`; did you mean `<postcondition>`?" in str(err.value)


def test_unknown_attribute_of_a_gc3_extension_element():
    text = _ring_text().replace("</algo>", '<postcondition><term rnak="0" out="0" src="0" in="0" cnt="1"/>'
                                           '</postcondition></algo>')
    with pytest.raises(IRFormatError) as err:
        from_xml(text, source="ring.xml")
    assert "`rnak`: unknown attribute of `<term>`; did you mean `rank`?" in str(err.value)


def test_cli_exits_2_naming_the_typo(tmp_path):
    from click.testing import CliRunner

    from gc3.cli import main

    bad = tmp_path / "bad.xml"
    bad.write_text(_ring_text().replace(' coll=', ' maxbytes="10" coll=', 1))
    r = CliRunner().invoke(main, ["check", str(bad)])
    assert r.exit_code == 2, r.output
    assert "did you mean `maxBytes`?" in r.output
