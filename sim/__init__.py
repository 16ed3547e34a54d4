"""artemis.sim"""
