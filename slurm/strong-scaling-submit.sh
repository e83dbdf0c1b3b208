#!/bin/bash
# (being written: issue 6)
